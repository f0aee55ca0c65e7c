"""Streaming TTRL: training server, client and pluggable reward server. Filled by the trainers issue."""
