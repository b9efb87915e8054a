"""What model calls cost, at the prices the team sets: ALWAYSON_CLAUDE_PRICES, USD per
million tokens of each kind, by model. None ship with alwayson (they change; the team copies
Anthropic's), so a model without one has no cost, said as such, never a guess.

A key is a model's name as its answers name it (ModelCall.model), or a prefix ending in `*`
("claude-sonnet-4-5*" prices its dated versions); an exact name wins, then the longest prefix.
"""

import math
from decimal import Decimal

from django.conf import settings

# The kinds of token a call is billed for, as ModelCall keeps them (TOKEN_FIELDS).
KINDS = ("input", "output", "cache_read", "cache_write")
PER = Decimal(1_000_000)


def check_prices(prices) -> dict:
    """ALWAYSON_CLAUDE_PRICES, checked: {model or prefix*: {kind: USD per million tokens}},
    every kind given, each a number of 0 or more."""
    if not isinstance(prices, dict):
        raise ValueError(
            'expected a JSON object of prices by model, like {"claude-sonnet-4-5": {"input": 3, '
            '"output": 15, "cache_read": 0.3, "cache_write": 3.75}}'
        )
    for model, price in prices.items():
        if not model or "*" in model[:-1]:
            raise ValueError(f"model {model!r}: a model's name, or a prefix ending in one *")
        if not isinstance(price, dict):
            raise ValueError(f"{model}: expected an object of USD per million tokens by kind")
        unknown = sorted(set(price) - set(KINDS))
        if unknown:
            raise ValueError(
                f"{model}: unknown kind(s) {', '.join(unknown)}; the kinds are {', '.join(KINDS)}"
            )
        missing = [kind for kind in KINDS if kind not in price]
        if missing:
            # Left out, a kind would cost nothing: a cost that looks known and is too low.
            raise ValueError(f"{model}: no price for {', '.join(missing)} (0 if it is free)")
        for kind, value in price.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(
                    f"{model}.{kind} must be a number of USD per million tokens, not {value!r}"
                )
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{model}.{kind} must be 0 or more, not {value!r}")
    return prices


def price_of(model: str) -> dict | None:
    """The price of `model`'s tokens by kind, or None when the settings have none."""
    prices = settings.ALWAYSON_CLAUDE_PRICES
    if model in prices:
        return prices[model]
    prefixes = [key for key in prices if key.endswith("*") and model.startswith(key[:-1])]
    return prices[max(prefixes, key=len)] if prefixes else None


def cost(calls) -> tuple[float | None, list[str]]:
    """What these calls cost, each `(model, {kind: tokens})` at its model's price, in USD;
    None, with the models that have no price, when any has none."""
    total, unpriced = Decimal(0), set()
    for model, tokens in calls:
        price = price_of(model)
        if price is None:
            unpriced.add(model)
            continue
        # Decimal: the settings' 0.3 is three tenths, not the float nearest it.
        total += sum(Decimal(str(price[kind])) * tokens.get(kind, 0) for kind in KINDS)
    if unpriced:
        return None, sorted(unpriced)
    return float(total / PER), []
