"""eigtrain: distributed pretraining of ordered representations (eigenfunctions with eigenvalues)."""

__version__ = "0.1.0"
