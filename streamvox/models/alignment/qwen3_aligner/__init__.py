"""Qwen3-ForcedAligner-0.6B in torch: word timings on the GPU (`aligner.Qwen3ForcedAligner`)."""
