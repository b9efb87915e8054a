"""The outbox app: pacing, merging, dispatch, the email and webhook channels, notices."""
