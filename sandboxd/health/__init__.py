"""Whether the daemon may take work and how it tells: its health, ``/readyz``, Prometheus
metrics, systemd's ``sd_notify`` and the daemon image's ``HEALTHCHECK``."""
