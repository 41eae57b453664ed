"""The fabric: topology files and generators, the node processes (host agents), the local
supervisor and the virtual fabric, fault control, flow jobs and reports, the compose testbed and
its dashboards."""
