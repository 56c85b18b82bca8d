"""Offline analysis of load-generator run directories: percentile tables, CDF plots, reports.

Reads files only; imports nothing from server/, loadgen/ or proto/.
"""
