"""Write a new agent module and its tests, and say how to switch it on.

`manage.py startagent support` writes support.py (a rule-based agent) and test_support.py (its
tests on alwayson.testing, passing as written) in the current directory; `--claude` writes a
tool and a policy for the Claude agent instead. A dotted name (acme.agents.support) goes in
that package, which must exist. Nothing is written over an existing file.
"""

import importlib.util
import json
import keyword
from pathlib import Path
from string import Template

from django.core.management.base import CommandError

from alwayson.command import AlwaysonCommand

TEMPLATES = Path(__file__).resolve().parent.parent.parent / "agent_templates"

# The Claude agent's policy the --claude module starts with: small refunds run, others ask.
CLAUDE_POLICY = {"refund": [{"when": {"amount": {"lt": 50}}, "then": "allow"}, {"then": "ask"}]}


class Command(AlwaysonCommand):
    help = (
        "Write an agent module NAME (rule-based, or --claude: a tool and a policy for the Claude"
        " agent) and a test file built on alwayson.testing, and print the setting that runs it."
    )

    def add_arguments(self, parser):
        parser.add_argument("name", help="the module's name, e.g. support or acme.agents.support")
        parser.add_argument(
            "--claude", action="store_true", help="a tool and a policy for the Claude agent"
        )
        parser.add_argument(
            "--directory",
            default=".",
            help="where the module's top package lives (default: the current directory)",
        )

    def handle(self, *args, name, claude, directory, **options):
        root = Path(directory)
        if not root.is_dir():
            raise CommandError(f"--directory: {directory} is not a directory")
        parts = check_name(name)
        package = root.joinpath(*parts[:-1])
        if len(parts) > 1 and not (package / "__init__.py").is_file():
            raise CommandError(
                f"{name}: {package} is not a package; create it (with an __init__.py) first"
            )
        module_path = package / f"{parts[-1]}.py"
        test_path = package / f"test_{parts[-1]}.py"
        for path in (module_path, test_path):
            if path.exists():
                raise CommandError(f"{path} exists already; nothing was written")
        if len(parts) == 1 and importlib.util.find_spec(name) is not None:
            raise CommandError(
                f"{name!r} is the name of a module Python imports already; pick another name"
            )
        kind = "claude" if claude else "rules"
        values = {
            "module": name,
            "test_path": test_path.as_posix(),
            "policy": json.dumps(CLAUDE_POLICY),
        }
        # Both rendered before either is written: a template error leaves nothing behind.
        module_text = render(f"{kind}.py-tpl", values)
        test_text = render(f"{kind}_test.py-tpl", values)
        module_path.write_text(module_text, encoding="utf-8")
        test_path.write_text(test_text, encoding="utf-8")
        self.stdout.write(self.enable_text(name, module_path, test_path, claude))

    def enable_text(self, name, module_path, test_path, claude) -> str:
        what = "a tool and a policy for the Claude agent" if claude else "a rule-based agent"
        lines = [f"Wrote {module_path} ({what}) and {test_path} (its tests)."]
        if claude:
            lines += [
                "",
                "To run the Claude agent with it for every inbox, in the settings' environment"
                " (.env):",
                "",
                "    ALWAYSON_AGENT=alwayson.claude.agent",
                f"    ALWAYSON_CLAUDE_TOOLS={name}",
                f"    ALWAYSON_CLAUDE_POLICY='{json.dumps(CLAUDE_POLICY)}'",
                "    ANTHROPIC_API_KEY=...",
                "",
                f"or for one inbox (with ALWAYSON_CLAUDE_TOOLS={name} as above), its agent"
                " configuration:",
                "",
                f"    from {name} import POLICY",
                '    AgentConfig.objects.create(inbox=inbox, agent="alwayson.claude.agent",'
                " policy=POLICY)",
            ]
        else:
            lines += [
                "",
                "To run it for every inbox, in the settings' environment (.env):",
                "",
                f"    ALWAYSON_AGENT={name}.agent",
                "",
                "or for one inbox, its agent configuration (admin: Agent configurations):",
                "",
                f'    AgentConfig.objects.create(inbox=inbox, agent="{name}.agent")',
            ]
        # Outside a project whose pytest settings name its Django settings, pytest-django
        # has none (and the kit stops the run, alwayson/testing/fixtures.py): the command
        # names them.
        lines += [
            "",
            "Its tests (in a project of your own, with its pytest settings instead):",
            "",
            f"    {TEST_COMMAND} {test_path}",
            "",
        ]
        return "\n".join(lines)


TEST_COMMAND = "DJANGO_SETTINGS_MODULE=alwayson.settings python -m pytest"


def check_name(name: str) -> list[str]:
    """The dotted name's parts; CommandError for one Python could not import as a module."""
    parts = name.split(".")
    for part in parts:
        if not part.isidentifier() or not part.isascii():
            raise CommandError(
                f"{name!r} is not a module name: use letters, digits and _ (not first), in"
                " dotted parts, such as support or acme.agents.support"
            )
        if keyword.iskeyword(part):
            raise CommandError(f"{name!r}: {part!r} is a Python keyword")
    if parts[-1].startswith("test"):
        raise CommandError(f"{name!r}: a module named test... would be collected as tests")
    return parts


def render(template: str, values: dict) -> str:
    return Template((TEMPLATES / template).read_text(encoding="utf-8")).substitute(values)
