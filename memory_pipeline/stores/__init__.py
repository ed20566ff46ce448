"""Storage: the LanceDB vector table and the embedding cache."""
