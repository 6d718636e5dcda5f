"""specgate: the umbrella command line that ties gateway, controller and drafters together."""

__version__ = "0.1.0"
