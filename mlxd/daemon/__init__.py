"""How the daemon speaks HTTP and lives as a process."""
