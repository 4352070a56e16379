"""The benchmarks behind `flashlane bench`: model (ours and a peer, in one run), serve."""
