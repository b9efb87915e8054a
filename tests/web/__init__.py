"""People's pages: approvals, the inbox page, teams, the admin and its dashboard, middleware."""
