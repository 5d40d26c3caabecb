"""A PyTorch-native benchmark of training bugs for ``comgra scan`` (see ``benchmarks/bug_benchmark.py``).

Each program is a short training script with one bug (``bug=True``) and, where meaningful, its fixed
twin (``bug=False``), recorded with the documented comgra API as a user records a run. ``harness``
holds the case description and the recording loop; ``programs_*`` the programs.
"""
