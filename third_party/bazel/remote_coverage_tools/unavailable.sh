#!/usr/bin/env bash
echo "remote_coverage_tools: coverage tools are unavailable offline (stand-in repository)" >&2
exit 1
