"""The harness the tests and the benchmarks share (bench/ imports it, never tests/): the
`torchrun` launcher, the real service processes (backend, worker, a cluster of loopback hosts)
and the Chromium the front-end checks drive. Not shipped with the product (pyproject.toml lists
the packages it installs); imported from the repository root, as tests/ and bench/ are."""
