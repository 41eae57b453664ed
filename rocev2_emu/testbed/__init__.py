"""The docker-compose testbed: the compose file, Prometheus' and Grafana's provisioning
(``compose``) and the dashboards (``dashboards``) written for a topology."""
