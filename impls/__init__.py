"""Built-in contenders, one per file, each exposing ``contender`` for the ``attnbench.impls`` entry point."""
