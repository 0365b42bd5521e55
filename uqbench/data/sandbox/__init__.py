"""The code sandbox: `host` runs untrusted programs in a child process under OS limits;
`prelude`, `runner` and `server` are the programs it runs (one file each, the prelude's text
first: `host.program`)."""
from uqbench.data.sandbox.host import SANDBOX_VERSION, Sandbox, SandboxResult, SandboxSession

__all__ = ["SANDBOX_VERSION", "Sandbox", "SandboxResult", "SandboxSession"]
