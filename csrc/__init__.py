"""C++/CUDA sources of fgplugin's ops, compiled against the installed torch on first import.

This folder ships inside the wheel as ``fgplugin._csrc`` so that ``fgplugin/_extension.py`` can
find the sources wherever the package is installed. It holds no Python code.
"""
