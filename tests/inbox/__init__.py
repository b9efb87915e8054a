"""The inbox app: events, dedupe, the lease, claims, finish, retries, webhooks."""
