"""labelshift: label shift estimation after Garg et al. (NeurIPS 2020)."""
