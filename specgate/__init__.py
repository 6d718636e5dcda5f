"""specgate: the umbrella command line that ties gateway, controller and drafters together."""

from importlib.metadata import PackageNotFoundError, version

try:  # one source of truth: pyproject.toml, through the installed package's metadata
    __version__ = version("specgate")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0.0.0+unknown"

# The gateway's default port for `specgate gateway` and `specgate up` alike.
# Not 8000: that is vLLM's own default (and `specgate sim-replica`'s), so a
# gateway started in front of a local replica (`make gateway
# REPLICA=http://127.0.0.1:8000`) must not want it too.
DEFAULT_GATEWAY_PORT = 8080
