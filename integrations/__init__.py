"""Code that runs in the caller's process, not in lipcast's: adapters for other frameworks' pipelines."""
