"""Codec decoders (codes -> waveform) and audio I/O (encoders, resampling)."""
