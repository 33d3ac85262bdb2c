"""`python -m training.tune`: the Optuna search (search.py), one trial (trial.py), its space (params.py), plots."""
