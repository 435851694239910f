"""One thin module per job (`python -m ray_jobs.<job>`) and the `rexeval` CLI."""
