from nondet.cli.app import main

main()
