"""Operations: the watchdog, archive retention, health probes and metrics."""
