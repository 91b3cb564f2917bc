"""One trainer for every drafter (`python -m specbench.train method=<name>`); each method adds its model and loss."""
