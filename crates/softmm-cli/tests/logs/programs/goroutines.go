// 16 goroutines allocate and drop slices of mixed sizes (the Go heap grows
// its arenas, the scavenger returns pages), then the program exits.
package main

import (
	"fmt"
	"sync"
)

func main() {
	var wg sync.WaitGroup
	sums := make([]int, 16)
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			var keep [][]byte
			for i := 0; i < 3000; i++ {
				b := make([]byte, 1024+((i*7919+g)%128)*1024)
				b[len(b)-1] = byte(i)
				sums[g] += int(b[len(b)-1])
				if i%100 == 0 {
					keep = append(keep, b)
				}
			}
			sums[g] += len(keep)
		}(g)
	}
	wg.Wait()
	total := 0
	for _, s := range sums {
		total += s
	}
	fmt.Println(total)
}
