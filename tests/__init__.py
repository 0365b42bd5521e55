"""The test suite: a fast tier (``make test-fast``) and the slow/e2e tiers marked in conftest."""
