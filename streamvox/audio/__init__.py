"""Audio for the wire: container encoding (formats), resampling (resample), G.711 (g711)."""
