"""clustertool: bring up, wire, feed and run multi-node GPU training clusters."""

__version__ = "0.1.0"
