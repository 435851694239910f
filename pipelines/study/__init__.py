"""Studies: a whole benchmark (datasets, steps, models) from one YAML file, run as a graph of
existing jobs (config.py: the file; builtin_jobs.py: the built-in jobs a step can run; plan.py: the checked graph;
runner.py: running it)."""
