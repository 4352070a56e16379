"""The fused keyed draw's Triton kernels; sampling/fused_draw.py is their host side."""
