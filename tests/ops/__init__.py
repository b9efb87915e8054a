"""Operations: health, metrics, logs and alerts, Sentry, retention, the deployment files."""
