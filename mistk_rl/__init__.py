"""mistk-rl: RL agents and environment orchestrators as REST services."""
__version__ = "0.1.0"
API_VERSION = "1.0.0"
