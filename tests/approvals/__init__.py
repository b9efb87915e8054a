"""The approvals app: answers, two-person approvals, the audit."""
