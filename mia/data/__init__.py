"""Datasets: the synthetic research world, loaders for the reference parquet/JSONL formats, image helpers."""
