from nondet.cli.app import run

run()
