"""The Claude agent: the agent against a loopback Messages API, its configuration."""
