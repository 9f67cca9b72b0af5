"""The console scripts' thin mains and their shared shell (common): one clear line and a
documented exit code.
"""
