"""placeholder"""
SHAPES = {}
