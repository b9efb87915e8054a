"""Whole-product suites: bad input everywhere, reserved keys, the query plans, the rules
under real concurrency, the stateful model check, the docs' links, a smoke test."""
