# Slurm integration (slurm-plugin/): the real-cluster test in
# slurm-plugin/slurmtest starts munged, slurmctld and five slurmd under a
# temporary directory; it only needs the binaries. install-deps.sh keeps the
# packages' postinst scripts from starting daemons.
APT_PACKAGES="slurmctld slurmd slurm-client munge"
