"""The x86 development host: conversion (hb_mapper), model tools, the verifier, board clients.

May import bpuemu.board (the runtime is the host's x86 simulator) and
bpuemu.common; nothing on the board side imports this package.
"""
