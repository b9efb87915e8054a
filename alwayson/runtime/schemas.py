"""A rule's `when` fitted to the tool's JSON Schema input: a condition that cannot hold on
any arguments the schema accepts is refused when the policy is saved."""

import re

from .conditions import DEFAULT, MEMBERSHIP, ORDERING, QUANTIFIERS, is_pointers, operations
from .json_values import ABSENT, INDEX, as_json, json_type, lookup, path, pointer, same


def check_against(where, tool, when, schema):
    """Refuse a condition that cannot hold on any arguments `schema` (the tool's JSON Schema
    input) accepts: a field it does not have, an operator on a type the field cannot be
    (prefix on a number, a regex on an integer), a value the field can never equal. Only what
    certainly cannot match is refused: where the schema does not say, the rule stands."""
    for field, condition in when.items():
        place = f"{where} tests {field!r}"
        node, always = _field(place, tool, field, schema, schema)
        _fits(place, tool, field, condition, node, always, schema)


def _field(where, tool, field, node, root, within=""):
    """The schema of `field` under `node` (the tool's input, or an element of the list
    `within`), and whether the schema makes the field always present."""
    segments = path(field, where)
    always, walked = True, ""
    for segment in segments:
        child, required = _child(node, segment, root)
        if child is None:
            raise ValueError(
                _not_in_schema(where, tool, field, segment, node, root, walked, within)
            )
        always = always and required
        node, walked = child, walked + pointer([segment])
    return node, always


def _not_in_schema(where, tool, field, segment, node, root, walked, within) -> str:
    fields = ", ".join(sorted(_fields(node, root))) or "none"
    if not walked and not within and not field.startswith("/"):
        hint = ""
        nested = pointer(field.split("."))
        if "." in field and _resolves(nested, root):
            hint = f"; for the nested field write {nested!r}"
        return f"{where}, which {tool} does not take; its arguments: {fields}{hint}"
    place = (
        (f"an element of {within!r}" + (f" at {walked}" if walked else "")) if within else walked
    )
    if "array" in (_types(node, root) or ()):
        return (
            f"{where}, which {tool} does not take: {place} is a list; name an element by its "
            f"index ({walked or field}/0) or test its elements with any or all"
        )
    return (
        f"{where}, which {tool} does not take: {place or 'its input'} has no field "
        f"{segment!r}; its fields: {fields}"
    )


def _resolves(field, root) -> bool:
    node = root
    for segment in path(field, "field"):
        node, _ = _child(node, segment, root)
        if node is None:
            return False
    return True


def _deref(node, root):
    """`node` with a local $ref ("#/$defs/...") followed; {} (says nothing) for another."""
    for _ in range(32):
        if not (isinstance(node, dict) and isinstance(node.get("$ref"), str)):
            return node
        ref = node["$ref"]
        target = lookup(root, path(ref[1:], "$ref")) if ref.startswith("#/") else ABSENT
        if not isinstance(target, dict):
            return {}
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return {}


def _branches(node):
    for key in ("anyOf", "oneOf", "allOf"):
        yield from node.get(key) or []


def _child(node, segment, root):
    """The schema of `segment` under `node` (None if the schema has no such field) and
    whether `node` requires it."""
    node = _deref(node, root)
    if not isinstance(node, dict):
        return None, False
    found, required = [], False
    properties = node.get("properties")
    if isinstance(properties, dict) and segment in properties:
        found.append(properties[segment])
        required = segment in (node.get("required") or [])
    else:
        for pattern, schema in (node.get("patternProperties") or {}).items():
            if re.search(pattern, segment):
                found.append(schema)
        if not found and isinstance(node.get("additionalProperties"), dict):
            found.append(node["additionalProperties"])
    if INDEX.fullmatch(segment):
        fixed, index = node.get("prefixItems") or [], int(segment)
        if index < len(fixed):
            found.append(fixed[index])
        elif isinstance(node.get("items"), dict):
            found.append(node["items"])
    for branch in _branches(node):
        child, _ = _child(branch, segment, root)
        if child is not None:
            found.append(child)
    if not found:
        return None, False
    return (found[0] if len(found) == 1 else {"anyOf": found}), required


def _fields(node, root) -> set:
    node = _deref(node, root)
    if not isinstance(node, dict):
        return set()
    names = set(node.get("properties") or {})
    for branch in _branches(node):
        names |= _fields(branch, root)
    return names


def _types(node, root) -> set | None:
    """The JSON types `node` allows; None when the schema does not say."""
    node = _deref(node, root)
    if not isinstance(node, dict):
        return None
    declared = node.get("type")
    if isinstance(declared, str):
        return {declared}
    if isinstance(declared, list):
        return set(declared)
    if "const" in node:
        return {json_type(node["const"])}
    if isinstance(node.get("enum"), list):
        return {json_type(value) for value in node["enum"]}
    either = [*(node.get("anyOf") or []), *(node.get("oneOf") or [])]
    if not either:
        return None
    kinds = [_types(branch, root) for branch in either]
    return None if None in kinds else set().union(*kinds)


def _takes(types, kind) -> bool:
    return types is None or kind in types or (kind == "integer" and "number" in types)


def _can_be(node, value, root) -> bool:
    node = _deref(node, root)
    if not _takes(_types(node, root), json_type(value)):
        return False
    if not isinstance(node, dict):
        return True
    if "const" in node and not same(value, node["const"]):
        return False
    values = node.get("enum")
    return not isinstance(values, list) or any(same(value, v) for v in values)


def _element_schema(node, root) -> dict:
    node = _deref(node, root)
    if not isinstance(node, dict):
        return {}
    schemas = [*(node.get("prefixItems") or [])]
    if isinstance(node.get("items"), dict):
        schemas.append(node["items"])
    schemas += [
        _element_schema(b, root) for b in _branches(node) if "array" in (_types(b, root) or ())
    ]
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas} if schemas else {}


def _fits(where, tool, shown, condition, node, always, root):
    """Refuse what `condition` cannot match on the field `shown` whose schema is `node`."""
    types = _types(node, root)
    field_is = f"the schema says {' or '.join(sorted(types))}" if types else ""
    default = condition.get(DEFAULT, ABSENT) if isinstance(condition, dict) else ABSENT
    if default is not ABSENT and not _can_be(node, default, root):
        raise ValueError(
            f"{where}: default {as_json(default)} is not a value the field can be: "
            f"{field_is or 'the schema does not allow it'}" + _choices(node, root)
        )
    for op, operand in operations(condition):
        values = [operand] if op in ("eq", "ne") else operand if op in MEMBERSHIP else []
        for value in values:
            if not _can_be(node, value, root):
                because = field_is or "the schema does not allow that value"
                raise ValueError(
                    f"{where}: {op} {as_json(value)} can never match: {because}"
                    + _choices(node, root)
                )
        if op in ORDERING:
            kind = "string" if isinstance(operand, str) else "number"
            if not (_takes(types, kind) or (kind == "number" and _takes(types, "integer"))):
                raise ValueError(
                    f"{where}: {op} {as_json(operand)} compares {kind}s, but {field_is}"
                )
        if op in ("prefix", "regex") and not _takes(types, "string"):
            raise ValueError(f"{where}: {op} needs a string field, but {field_is}")
        if op == "exists" and operand is False and always:
            raise ValueError(f"{where}: exists false can never hold: the schema requires it")
        if op in QUANTIFIERS:
            if not _takes(types, "array"):
                raise ValueError(f"{where}: {op} needs a list field, but {field_is}")
            element = _element_schema(node, root)
            if not is_pointers(operand):
                _fits(f"{where} {op}", tool, shown, operand, element, False, root)
                continue
            for field, inner in operand.items():
                place = f"{where} {op} {field!r}"
                inner_node, _ = _field(place, tool, field, element, root, within=shown)
                _fits(place, tool, field, inner, inner_node, False, root)


def _choices(node, root) -> str:
    node = _deref(node, root)
    if isinstance(node, dict) and isinstance(node.get("enum"), list):
        return f" (one of {', '.join(as_json(v) for v in node['enum'])})"
    return ""
