module sigma-supervise/goclient

go 1.22
