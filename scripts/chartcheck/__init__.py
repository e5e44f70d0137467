"""The checks scripts/chart.py runs on the Helm chart charts/shardwise, one module per concern."""
