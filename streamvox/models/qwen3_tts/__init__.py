"""Qwen3-TTS-12Hz in pure torch: talker, code predictor, speaker encoder and engine runner."""
