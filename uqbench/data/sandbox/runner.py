"""One run per process (`Sandbox.run`): argv = solution path, nonce, guards on ("1") or off."""
import sys

from uqbench.data.sandbox.prelude import uqb_exec  # the prelude's text, in the program

_uqb_argv = sys.argv[1:]
del sys.argv[1:]
uqb_exec(_uqb_argv[0], _uqb_argv[1], _uqb_argv[2] == "1")
