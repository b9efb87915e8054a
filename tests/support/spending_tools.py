"""An application tool for the Claude agent in a worker process
(ALWAYSON_CLAUDE_TOOLS = ["tests.support.spending_tools"]): each call spends outside the
database, one POST to the egress service "outside" naming the run
(tests/processes/test_blackhole_pg.py)."""

from alwayson.claude import tool


@tool(
    input_schema={
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    },
    action="spend {n}",
)
def spend(call, n):
    """Spend once."""
    run = call.run
    answer = run.http.post(
        "outside",
        "/spend",
        json={"holder": run.holder, "generation": run.generation, "n": n, "tool": True},
    )
    return {"spent": n, "status": answer.status}
