"""What the egress gateway raises to the agent that called it."""


class EgressRefused(Exception):
    """The gateway refused the call before anything left the process; the message says why
    in words an agent (or a model reading a tool result) can act on."""


class EgressFailed(Exception):
    """The call was allowed but did not get an answer: a timeout, a refused connection, a
    response over the size limit, or a credential missing from the environment."""
