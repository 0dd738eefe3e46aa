"""What every benchmark shares: the record writer (``records``), machine and load (``machine``), the generated
clustered galleries (``galleries``) and the stand-in exports (``exports``)."""
