"""Synthetic kernels with known eigenpairs (paper section 5.1, appendix G): exact sampler, encoder,
training, extraction and metrics; CLI `eigtrain-synthetic` (eigtrain.synthetic.cli)."""
