"""Files the package ships: the warm-start adapters (mia.apps.warm_start)."""
