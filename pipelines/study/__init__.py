"""Studies: a whole benchmark (datasets, stages, models) from one YAML file, run as a graph of
existing jobs (config.py: the file; jobs.py: what a stage can run; plan.py: the checked graph;
runner.py: running it)."""
