"""Named sweeps as TOML data (quick, standard, gpu, …) and the pytest-benchmark front end."""
